"""Running a trained model: per-head KV caches sized by each window (kvcache.py), generation with them
(generate.py), and the exact and measured inference cost of a plan (cost.py)."""
