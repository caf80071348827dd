"""Parallel training strategies, one module each; every one takes a plain model and a process group.

Data parallelism (lesson 03, `lessons/03_data_parallel.ipynb`):
    data.py      shard_batch, uneven_loss_scale, broadcast_parameters, average_gradients, train_step
    buckets.py   Bucket, make_buckets, all_reduce_buckets: a few big all-reduces instead of many
    overlap.py   DataParallel: buckets all-reduced from gradient hooks during backward, no_sync()
    compare.py   the variants side by side (and torch DDP): wrap, time_variants, count_step
"""
