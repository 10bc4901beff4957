"""Where replication groups live: the controller that places them and its pure policy."""
