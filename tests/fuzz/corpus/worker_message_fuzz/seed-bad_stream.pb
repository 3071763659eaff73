"
	j"x2yP