"""Policies: the YAML file's typed schema, its loader, and the choice of a policy per request."""
