"""Training the head end to end: the recipe from a pair to a head folder, and the zoo pair."""
