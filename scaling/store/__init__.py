"""What a run leaves behind, written safely: storage, checkpoints, leases, records, metrics."""
