"""Hardware profiles, machine detection, device checks and memory statistics."""
