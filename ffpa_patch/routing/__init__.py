"""Per-call attention routing: decide (pure) -> masks -> kernel or fallback -> stats."""
