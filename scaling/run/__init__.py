"""A run's life: the loop, its members, stops, endings, tracking; a trained run used."""
