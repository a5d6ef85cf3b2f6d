"""The daemon assembled: the Gateway that joins channels, store and agent, the app that starts and
stops it in order (lifecycle), and the cluster of daemons sharing one PostgreSQL."""
