output "bootstrap_servers" {
  description = "bootstrap.servers for Kafka clients."
  value       = module.nodes.bootstrap_servers
}

output "controller_endpoints" {
  description = "The controllers (strata topic / quorum --controller)."
  value       = module.nodes.controller_endpoints
}

output "broker_racks" {
  description = "Each broker's rack (availability zone)."
  value       = module.nodes.broker_racks
}

output "cold_url" {
  description = "The cold tier: --url of strata-replay and strata-compactor."
  value       = module.bucket.cold_urls[var.prefix]
}

output "replay_role_arn" {
  description = "The read-only role the audit team assumes for strata-replay."
  value       = module.iam.replay_role_arn
}

output "compactor_instance_profile" {
  description = "Instance profile for the host that runs strata-compactor."
  value       = module.iam.compactor_instance_profile
}
