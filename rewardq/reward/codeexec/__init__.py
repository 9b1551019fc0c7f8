"""Code execution for the code data sources (codecontests, apps, codeforces, taco).

Two backends score a response against the test cases in its ``ground_truth``:

* :mod:`.sandbox_fusion`: verl's SandboxFusion protocol over HTTP, when ``sandbox_fusion_url``
  is configured, with its concurrency held across the fleet;
* :mod:`.local`: verl's ``prime_code`` rules, every program run by :mod:`.sandbox` in isolated
  child processes (:mod:`.harness`, :mod:`.harness_fs`, :mod:`.harness_guard`,
  :mod:`.harness_program` and :mod:`.harness_cgroup` are the part that runs inside the sandbox);
  ``assert_case`` tests as SandboxFusion runs them, with tripwires (:mod:`.asserts`, and inside
  the sandbox :mod:`.harness_asserts`, :mod:`.harness_test_compiler` and :mod:`.harness_wires`).

:mod:`.probe` (what a sandbox must run before it scores anything), :mod:`.cases` (the program
and its test cases), :mod:`.compare` (is an output right), :mod:`.result` (what a score says),
:mod:`.settings`, :mod:`.stats` and :mod:`.runtime` (one worker's backend, limits and counters)
hold the rest. The scorers in the default table are in
:mod:`rewardq.reward.scoring.code`. User documentation: docs/code-execution.md.
"""
