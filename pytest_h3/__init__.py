"""pytest-h3: the pytest plugin of the MiniMax-H3 qualification gates."""
