"""The hint levels of exercises/11_checkpoints.ipynb, by exercise id."""

HINTS = {
    "resume_state": (
        "every piece a step reads, from this rank: the model, the optimizer, the schedule, both "
        "random streams, the data position",
        "return a dict with 'model', 'optimizer', 'scheduler', 'rng', 'tracker' and 'data': "
        "everything a step reads, from this rank",
        "each part hands out its own state: run.model, run.optimizer, run.scheduler and run.data "
        "have state_dict(); torch's default generator has torch.get_rng_state(); lesson 04's "
        "tracker keeps its streams in run.tracker.states",
        "copy what can change: the model's tensors (clone), the tracker's states (clone each); "
        "every rank returns its own, rank 1's tracker stream is not rank 0's",
    ),
    "load_my_shard": (
        "find this rank's [start, end) first; then copy from each chunk only the part that "
        "overlaps it",
        "this rank's piece is the slice of the whole that torch.tensor_split(whole, m) gives it; "
        "find its [start, end) first",
        "with L values on m ranks, rank r holds L // m values, one more when r < L % m; each "
        "chunk covers [offset, offset + length) of the whole",
        "for each chunk that overlaps [start, end): lo = max(start, offset), hi = min(end, offset "
        "+ length); copy files.read(file)[lo - offset : hi - offset] into your piece at "
        "[lo - start, hi - start)",
    ),
    "checkpoint_interval": (
        "the job's M comes from every GPU's failures together; δ from the bytes and the bandwidth",
        "M, the job's mean seconds between failures, is 3600 / (n_gpus · λ); δ is "
        "state_bytes / bandwidth",
        "Young's interval is sqrt(2 δ M): it balances the cost of saving, δ/τ, against the work "
        "lost, τ/(2M)",
        "goodput = 1 - δ/τ - (τ/2 + R)/M at τ = sqrt(2 δ M); return (τ, goodput)",
    ),
    "is_complete": (
        "a save becomes visible last: check the folder's name, its metadata, and every file the "
        "metadata lists",
        "a checkpoint is complete when its save committed: a step_N folder (not .tmp) with its "
        "metadata file",
        "read metadata.json; its 'files' maps each file name to the bytes it was written with",
        "False when the folder ends in .tmp, the metadata is missing, or any listed file is "
        "missing or has another size (os.path.getsize); True otherwise",
    ),
}
