"""What a running proxy tells its operator: logs, telemetry lines, OpenTelemetry spans and Prometheus metrics."""
