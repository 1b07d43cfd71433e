"""A sweep in pieces: one time-limited command on a lent machine trains what fits, and its records come back.

``packages`` (what the machine lacks, installed from carried wheels; standard library only),
``plan`` (the pieces and the speed model; ``PieceSweep``), ``run`` (one piece), ``ledger`` (the committed
list of finished runs and timed pieces), ``accept`` (records that came back, checked and added).
"""
