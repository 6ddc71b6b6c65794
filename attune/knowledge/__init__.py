"""The skill's knowledge as code and data: the lever catalog, lessons, layouts and the memory
estimate."""
