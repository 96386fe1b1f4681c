#!/usr/bin/env python3
"""Kept so that commands written before SCAN preparation moved keep working: runs
``scripts/prepare/scan.py`` with the same arguments (see that script)."""
import os
import runpy

if __name__ == "__main__":
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "prepare", "scan.py"),
                   run_name="__main__")
