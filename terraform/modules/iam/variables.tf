variable "cluster_name" {
  description = "Name of the Strata cluster; roles and instance profiles are named after it."
  type        = string
}

variable "bucket_name" {
  description = "The cold-tier bucket (modules/bucket)."
  type        = string
}

variable "prefix" {
  description = "The cluster's key prefix in the bucket: the brokers' [cold] url is s3://BUCKET/PREFIX. Every S3 permission is scoped to it."
  type        = string

  validation {
    condition     = can(regex("^[a-zA-Z0-9][a-zA-Z0-9._-]*(/[a-zA-Z0-9._-]+)*$", var.prefix))
    error_message = "A non-empty prefix without leading or trailing slash (e.g. \"prod-1\")."
  }
}

variable "kms_key_arn" {
  description = "The bucket's SSE-KMS key (modules/bucket output kms_key_arn)."
  type        = string
}

variable "replay_principal_arns" {
  description = "IAM principals (the audit/replay team's roles or users) allowed to assume the read-only replay role."
  type        = list(string)

  validation {
    condition     = length(var.replay_principal_arns) > 0 && alltrue([for a in var.replay_principal_arns : can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:(role|user)/", a))])
    error_message = "Name the audit team's IAM roles or users by ARN (no wildcards, no account roots)."
  }
}

variable "compactor_service_principals" {
  description = "AWS services that run strata-compactor and assume its role (an EC2 instance by default; add ecs-tasks.amazonaws.com for ECS)."
  type        = list(string)
  default     = ["ec2.amazonaws.com"]
}

variable "enable_ssm" {
  description = "Attach AmazonSSMManagedInstanceCore to the node roles, for shell access through Session Manager instead of SSH (no SSH port is opened)."
  type        = bool
  default     = true
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
