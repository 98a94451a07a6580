"""A model's scheduler: its queue's batches run on free instances, direct inner calls, cancels, ensembles' runs."""
