output "bucket_name" {
  description = "The cold-tier bucket."
  value       = aws_s3_bucket.cold.id
}

output "bucket_arn" {
  description = "Its ARN."
  value       = aws_s3_bucket.cold.arn
}

output "kms_key_arn" {
  description = "The SSE-KMS key every object is encrypted with (the iam module grants its use)."
  value       = aws_kms_key.cold.arn
}

output "cold_urls" {
  description = "The [cold] url of each cluster prefix, for the brokers, strata-replay and strata-compactor."
  value       = { for p in var.cluster_prefixes : p => "s3://${aws_s3_bucket.cold.id}/${p}" }
}
