"""The one name the process log and the request log share for structured fields."""

# The `extra` key whose dict reshape/app/logs.py's JSON formatter merges into the log object.
FIELDS = "fields"
