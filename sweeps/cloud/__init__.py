"""Sweeps on rented accelerators with SkyPilot: ``python -m sweeps.launch sky`` (``command.py``).

``tasks.py`` builds the SkyPilot tasks of a sweep's shares, ``regions.py``
checks where they may run, ``jobs.py`` records the submitted jobs in the work
directory and acts on them, ``lockfile.py`` makes and reads
``constraints.txt``, the versions every host installs.
"""
