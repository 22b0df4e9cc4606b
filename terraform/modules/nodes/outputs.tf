output "bootstrap_servers" {
  description = "The Kafka bootstrap addresses (bootstrap.servers), comma-separated."
  value       = join(",", local.broker_endpoints)
}

output "broker_endpoints" {
  description = "Each broker's Kafka listener, HOST:PORT, by node id order."
  value       = local.broker_endpoints
}

output "controller_endpoints" {
  description = "The controllers' gRPC addresses (strata topic / quorum --controller, [cluster] controllers)."
  value       = local.controller_addresses
}

output "broker_racks" {
  description = "Each broker's [cluster] rack: its availability zone, by node id."
  value       = { for i in range(var.broker_count) : tostring(i + 1) => local.zones[i % 3] }
}

output "broker_instance_ids" {
  description = "The brokers' instances, by node id order."
  value       = aws_instance.broker[*].id
}

output "controller_instance_ids" {
  description = "The controllers' instances, by node id order."
  value       = aws_instance.controller[*].id
}

output "cluster_security_group_id" {
  description = "The group every node is in (internal ports between members)."
  value       = aws_security_group.cluster.id
}

output "kafka_security_group_id" {
  description = "The brokers' client-facing group (the Kafka listener only)."
  value       = aws_security_group.kafka_clients.id
}
