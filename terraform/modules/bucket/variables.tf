variable "bucket_name" {
  description = "Name of the cold-tier bucket (the bucket of the brokers' [cold] url = \"s3://BUCKET/PREFIX\")."
  type        = string
}

variable "cluster_prefixes" {
  description = "Key prefixes of the clusters that tier into this bucket, one per cluster (the PREFIX of s3://BUCKET/PREFIX), without leading or trailing slashes. The lifecycle rule is scoped to them."
  type        = list(string)

  validation {
    condition = length(var.cluster_prefixes) > 0 && alltrue([
      for p in var.cluster_prefixes : can(regex("^[a-zA-Z0-9][a-zA-Z0-9._-]*(/[a-zA-Z0-9._-]+)*$", p))
    ])
    error_message = "Give at least one prefix; a prefix has no leading or trailing slash (e.g. \"prod-1\")."
  }
}

variable "abort_incomplete_multipart_upload_days" {
  description = "Days after which a multipart upload that was never completed (a broker or compactor killed mid-upload) is aborted and its parts freed."
  type        = number
  default     = 1

  validation {
    condition     = var.abort_incomplete_multipart_upload_days >= 1
    error_message = "At least one day: an upload in progress must never be aborted."
  }
}

variable "access_log_bucket" {
  description = "An existing bucket that receives this bucket's server access logs (S3 access logs cannot go to an SSE-KMS bucket; use one with SSE-S3)."
  type        = string
}

variable "kms_deletion_window_days" {
  description = "Waiting period before the bucket's KMS key is deleted once scheduled for deletion."
  type        = number
  default     = 30
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
