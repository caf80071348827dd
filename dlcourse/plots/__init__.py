"""Figures drawn from measured data, one module per lesson topic; pure functions of their inputs."""
