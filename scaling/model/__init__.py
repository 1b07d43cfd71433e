"""The model and its compiled step: transformer, loss, parametrization, optimizer, mesh."""
