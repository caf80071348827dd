"""Data parallelism (lesson 03, `lessons/03_data_parallel.ipynb`): every rank holds the whole
model, runs its slice of the batch, and the ranks average their gradients.

    steps.py     shard_batch, uneven_loss_scale, broadcast_parameters, average_gradients, train_step
    buckets.py   Bucket, make_buckets, all_reduce_buckets: a few big all-reduces instead of many
    overlap.py   DataParallel: buckets all-reduced from gradient hooks during backward, no_sync()
    compare.py   the variants side by side (and torch DDP): wrap, time_variants, count_step
    predict.py   the step's communication by the alpha-beta model, and a bucket-size sweep
    tokens.py    loss normalised by tokens for variable-length data under accumulation
"""
