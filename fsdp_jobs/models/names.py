"""Parameter names as the model's code writes them (shared by the rank side and the HF export)."""


def plain_name(name: str) -> str:
    """A parameter's or buffer's name in the model as written: without the prefixes that activation
    checkpointing and compile add."""
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")
