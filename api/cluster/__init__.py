"""Engine replicas on Ray Serve (`--replicas N`): the deployments, the replicas' engine client,
and the request router that reads what each replica's radix tree holds. Imported only with that flag."""
