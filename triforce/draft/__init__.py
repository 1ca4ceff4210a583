"""`triforce train-draft`: distil a small tier-1 draft LM from a target, on long text, on a CPU."""
