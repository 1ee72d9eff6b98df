"""psrv.server: the parameter server in each process and the `psrv` command line."""
