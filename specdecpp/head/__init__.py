"""The acceptance prediction head: the model, its folder's card and files, publishing it."""
