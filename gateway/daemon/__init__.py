"""The daemon assembled: the Gateway that joins channels, store and agent, the app that starts and
stops it in order (lifecycle), the status socket and start-up summary it shows the operator, and the
cluster of daemons sharing one PostgreSQL."""
