//go:build tools

// Package tools pins helm for bins/build-helm.sh (built, never imported).
package tools

import _ "helm.sh/helm/v3/cmd/helm"
