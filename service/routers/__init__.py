"""One router per resource: health, plans, sizing, profiles, runs."""
