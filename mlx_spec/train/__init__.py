"""Training: the demo tokenizer and target, and drafter distillation (MTP head, draft model)."""
