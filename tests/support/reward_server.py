"""A loopback HTTP server that answers like a vLLM or SGLang reward model (the ``disrm`` manager's tests)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rewardq.reward.tokenizer import DEMO_PATH

# the reward model's template starts with its BOS, as Llama's does; the manager strips it
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)
DEFAULTS = {
    "/classify": {"object": "list", "data": [{"index": 0, "label": "LABEL_0", "probs": [0.17, 0.83]}]},
    "/v1/embeddings": {"object": "list", "data": [{"index": 0, "embedding": [0.5, -1.25]}]},
}


class FakeRewardServer:
    """A threaded HTTP server on 127.0.0.1:<free port>; ``script`` holds answers to give first."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.script: list[tuple[Any, ...]] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with server.lock:
                    server.requests.append(
                        {
                            "path": self.path,
                            "json": json.loads(body),
                            "t": time.monotonic(),
                            "content_type": self.headers["Content-Type"],
                        }
                    )
                    step = server.script.pop(0) if server.script else None
                if step and step[0] == "sleep":
                    time.sleep(step[1])
                    step = None
                status, payload = step or ((200, DEFAULTS[self.path]) if self.path in DEFAULTS else (404, "no"))
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and hung up (the timeout test)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def rm_tokenizer_folder(folder: Path) -> str:
    """A reward-model tokenizer folder: the demo vocabulary with a chat template that starts with its BOS."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(DEMO_PATH, folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "chat_template": TEMPLATE})
    )
    return str(folder)
