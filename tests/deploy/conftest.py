"""Tests of deploy/: the Kubernetes manifests and Grafana dashboard (test_k8s*.py,
test_dashboard*.py) and the compose file and image (test_compose*.py). Shared fixtures only."""
