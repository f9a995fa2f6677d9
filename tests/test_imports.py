"""Every module of the package and of the developer tools (dev/) imports: a module no test runs (a benchmark, a CLI entry) cannot rot unnoticed
when an API it uses changes. In a fresh process, so that what it imports stays out of the suite's process."""

import subprocess
import sys

CODE = """
import importlib, pkgutil, tensorhub_verl, tensorhub_dev
failed = []
for package in (tensorhub_verl, tensorhub_dev):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if module.name.endswith("__main__"):
            continue  # runs its command when imported
        try:
            importlib.import_module(module.name)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            failed.append(f"{module.name}: {e!r}")
print("\\n".join(failed))
"""


def test_every_module_of_the_package_imports():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "", out.stdout
