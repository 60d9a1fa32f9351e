"""Training the head: its loss, records to examples, the recipe from a pair to a head folder, the zoo pair."""
