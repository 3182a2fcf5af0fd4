//go:build tools

// Package h2spec pins the h2spec build (and its dependencies, in go.sum) that
// tests/hardening/test_h2spec.py runs; `make test-deps` installs it into .venv/bin.
package h2spec

import _ "github.com/summerwind/h2spec/cmd/h2spec"
