variable "region" {
  description = "AWS region of the cluster and its bucket."
  type        = string
}

variable "cluster_name" {
  description = "Name of the cluster (resource names, tags)."
  type        = string
  default     = "strata-prod-1"
}

variable "bucket_name" {
  description = "The cold-tier bucket to create."
  type        = string
}

variable "prefix" {
  description = "The cluster's prefix in the bucket: [cold] url = s3://BUCKET/PREFIX."
  type        = string
  default     = "prod-1"
}

variable "access_log_bucket" {
  description = "An existing bucket (SSE-S3) that receives the cold-tier bucket's access logs."
  type        = string
}

variable "vpc_id" {
  description = "The VPC."
  type        = string
}

variable "subnet_ids" {
  description = "Three private subnets in three availability zones."
  type        = list(string)
}

variable "client_cidr_blocks" {
  description = "Networks of the Kafka clients."
  type        = list(string)
}

variable "monitoring_security_group_ids" {
  description = "Security groups of the Prometheus scrapers."
  type        = list(string)
  default     = []
}

variable "replay_principal_arns" {
  description = "The audit team's IAM roles, allowed to assume the read-only replay role."
  type        = list(string)
}

variable "strata_binary_url" {
  description = "HTTPS URL of the strata release binary (x86_64 Linux)."
  type        = string
}

variable "strata_binary_sha256" {
  description = "Its SHA-256."
  type        = string
}
