"""The hint levels of exercises/01_memory.ipynb, by exercise id."""

HINTS = {
    "count_gpt_params": (
        "print the named parameters of a tiny GPT and write each shape in terms of the config",
        "the parameters are the two embeddings, L identical blocks, the final LayerNorm and the "
        "output layer; count one block, then multiply",
        "a block holds two LayerNorms and four Linear layers (qkv h to 3h, proj h to h, fc h to "
        "4h, proj 4h to h); biases exist only with bias=True, and a tied output layer is the "
        "token embedding, counted once",
    ),
    "zero_model_state": (
        "start from the bytes each parameter costs in each part, then ask what each stage "
        "splits over the dp ranks",
        "mixed precision keeps 2 + 2 + 12 bytes per parameter (weights, gradients, fp32 "
        "optimizer state), fp32 training 4 + 4 + 8; stage 1 splits the optimizer state",
        "multiply n_params by each part's bytes; stage s divides by dp the first s of "
        "(optimizer, gradients, parameters) and leaves the others whole",
    ),
    "mlp_activation_bytes": (
        "for each operation of the block, ask what its backward needs to remember",
        "a Linear keeps its input for its weight's gradient, GELU keeps its input, dropout keeps "
        "its mask; measure one with SavedTensorLog to see the sizes",
        "count the saved tensors in units of one (B, T, h) tensor: fc's input is 1, GELU's input "
        "and proj's input are 4h wide, the dropout mask 1 when dropout > 0; times the element "
        "size",
    ),
}
