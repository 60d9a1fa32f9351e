"""The acceptance prediction head: the model, its objective, its inputs from records, its folder and publishing."""
