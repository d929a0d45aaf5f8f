"""Tasks: what is learned on the sampled subgraphs (base.py declares the seam)."""
