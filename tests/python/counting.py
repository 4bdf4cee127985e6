"""Runs a test module's unittest cases the way scripts/test.sh counts them: a `SKIPPED name:
reason` line for each skip (counted apart) and a closing `test result:` line."""

import sys
import unittest


def run(module, prefix, label):
    """Runs `module`'s tests; exits 1 if any failed."""

    class CountingResult(unittest.TextTestResult):
        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            print(f"SKIPPED {prefix}_{test.id().split('.')[-1]}: {reason}", flush=True)

    runner = unittest.TextTestRunner(verbosity=2, resultclass=CountingResult, stream=sys.stdout)
    result = runner.run(unittest.defaultTestLoader.loadTestsFromModule(module))
    # A test counts once however many of its subtests failed (a class's set-up error counts one).
    failed = len({getattr(test, "test_case", test).id() for test, _ in result.failures + result.errors})
    passed = max(result.testsRun - failed, 0)
    print(f"test result: {'ok' if failed == 0 else 'FAILED'}. {passed} passed; {failed} failed ({label})")
    sys.exit(1 if failed else 0)
