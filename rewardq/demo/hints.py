"""The ``redis-cli`` and ``rewardq`` commands the demo prints for a namespace it kept, runnable as printed.

``redis-cli`` knows neither rewardq's ``redis+cluster://`` scheme nor a cluster's other nodes, so
the commands differ by the kind of server:

* a single Redis: ``redis-cli -u redis://host:port/db`` reads and deletes everything;
* a Redis Cluster: ``-u redis://host:port`` (the plain scheme) with ``-c``, so a command on one key
  follows the node's ``MOVED`` answer to the node holding it; ``--scan`` reads only the node it is
  connected to, so listing the namespace loops over every primary that ``CLUSTER NODES`` names,
  scanning each (``-u URL -h NODE_HOST -p NODE_PORT``: the URL's user, password and TLS, the node's
  address); and deletion sends one ``UNLINK`` per key through ``-c``, since a ``DEL`` of several keys
  in different slots is refused (``CROSSSLOT``).

Each line is complete on its own (no shell variable set by an earlier line), so any one of them can
be copied. A password in the URL is printed as ``***`` (put it back, or give it with ``REDISCLI_AUTH``
and leave it out of the URL). ``tests/integration/test_demo_hints.py`` runs every line with ``bash``
against a single Redis and a local 3-master cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

from rewardq.queue.connection import redact_url, split_cluster
from rewardq.queue.keys import Keyspace

__all__ = ["KeptHints", "kept_hints", "kept_note"]

#: Every primary of the cluster as ``host:port``, from ``CLUSTER NODES``: field 2 is
#: ``ip:port@cport[,hostname]``, field 3 the flags (``myself,master``, ``master,fail`` ...).
_PRIMARIES = "awk '$3 ~ /master/ && $3 !~ /fail|noaddr/ {sub(/@.*/, \"\", $2); print $2}'"


@dataclass(frozen=True)
class KeptHints:
    """What to run to look at a kept namespace, and the one line that deletes it."""

    look: list[str]
    delete: str


def kept_hints(url: str, namespace: str, keys: list[str], *, cluster: bool = False) -> KeptHints:
    """The commands for ``namespace`` on ``url`` (a ``redis+cluster://`` URL or ``cluster=True`` is a cluster).

    ``keys`` are output keys the demo pushed; the last one gets an ``HGETALL`` and an ``inspect`` line.
    The URL is printed with its password as ``***``.
    """
    plain, is_cluster = split_cluster(url, cluster)
    shown, plain_shown = redact_url(url), redact_url(plain)
    ks = Keyspace(namespace)  # the demo's namespaces have one shard
    pattern = f"'{namespace}:*'"
    if is_cluster:
        one = f"redis-cli -c -u {plain_shown}"
        scan = (
            f"for n in $(redis-cli -u {plain_shown} CLUSTER NODES | {_PRIMARIES}); do "
            f'redis-cli -u {plain_shown} -h "${{n%:*}}" -p "${{n##*:}}" --scan --pattern {pattern}; done'
        )
        delete = f"{scan} | xargs -r -n 1 {one} UNLINK"
    else:
        one = f"redis-cli -u {plain_shown}"
        scan = f"{one} --scan --pattern {pattern}"
        delete = f"{scan} | xargs -r {one} DEL"
    target = f"--redis-url {shown} --namespace {namespace}"
    look = [f"{scan} | head", f"{one} XREVRANGE '{ks.done(0)}' + - COUNT 3"]
    if keys:
        look.append(f"{one} HGETALL '{ks.reward_key(keys[-1])}'")
        look.append(f"rewardq inspect {keys[-1]} {target}")
    look.append(f"rewardq status {target}")
    return KeptHints(look, delete)


def kept_note(namespace: str, url: str | None, keys: list[str]) -> str:
    """What the demo says at the end about the namespace it kept (rich markup), with the commands to look."""
    from rich.markup import escape

    if url is None:
        return (
            f"[yellow]namespace {escape(namespace)} lived in the embedded stand-in, which is gone now; "
            "run with --redis-url to keep its keys[/]"
        )
    hints = kept_hints(url, namespace, keys)
    lines = [f"[bold]kept namespace {escape(namespace)}[/] on {escape(redact_url(url))}; look at it with:"]
    lines += [f"  {escape(line)}" for line in hints.look]
    lines += ["delete it with:", f"  {escape(hints.delete)}"]
    return "\n".join(lines)
