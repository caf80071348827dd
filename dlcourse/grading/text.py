"""Failure lines cut to fit a table or a gradebook cell (`dlcourse grade`, `check_all`)."""


def trim(text, width):
    """`text` cut to at most `width` characters at a space, "..." marking the cut; a single
    word longer than that is cut where it must be."""
    if len(text) <= width:
        return text
    kept = text[:width - 3]
    cut = kept.rsplit(" ", 1)[0] if " " in kept else kept
    return cut.rstrip(" ,;:") + "..."
