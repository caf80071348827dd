"""Parallel training strategies, one module each; every one takes a plain model and a process group."""
