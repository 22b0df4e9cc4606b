output "broker_instance_profile" {
  description = "Instance profile of the brokers (modules/nodes)."
  value       = aws_iam_instance_profile.broker.name
}

output "controller_instance_profile" {
  description = "Instance profile of the controllers (no object-store access)."
  value       = aws_iam_instance_profile.controller.name
}

output "compactor_instance_profile" {
  description = "Instance profile for a host running strata-compactor."
  value       = aws_iam_instance_profile.compactor.name
}

output "broker_role_arn" {
  description = "The brokers' role."
  value       = aws_iam_role.broker.arn
}

output "compactor_role_arn" {
  description = "strata-compactor's role."
  value       = aws_iam_role.compactor.arn
}

output "replay_role_arn" {
  description = "The read-only role the audit team assumes to run strata-replay."
  value       = aws_iam_role.replay.arn
}
