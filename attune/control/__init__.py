"""The control plane: the campaign spec, run generation, admission, charging, scoring, promotion,
the search rules and shipping. The broker serves it; nothing below it imports it."""
