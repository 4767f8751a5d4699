//go:build tools

// Package tools pins kube-state-metrics for bins/build.sh (built, never imported).
package tools

import _ "k8s.io/kube-state-metrics/v2"
