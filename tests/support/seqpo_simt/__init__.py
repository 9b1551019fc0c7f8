"""An example of a manager that needs the whole trajectory: SeqPO-SiMT's simultaneous-translation
reward (:mod:`.manager`), its metrics (:mod:`.metrics`) and synthetic trajectories (:mod:`.data`).

The tests score it through real workers and discover it through an entry point, installed for
the test (:data:`ENTRY_POINT`, :func:`tests.support.entry_points.installed_entry_points`), as a
third-party package that declares it in the ``rewardq.managers`` group would be.
"""

#: The ``rewardq.managers`` entry point a package shipping this manager would declare.
ENTRY_POINT = {"seqpo_simt": "tests.support.seqpo_simt.manager:SeqPOSiMTManager"}
