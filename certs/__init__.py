"""CA tooling: create, load, check and describe the interception CA."""
