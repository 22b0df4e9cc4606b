variable "cluster_name" {
  description = "Name of the cluster; resources are named after it."
  type        = string
}

variable "cluster_id" {
  description = "[cluster] cluster_id: the cluster id Kafka clients see, the same on every broker."
  type        = string
  default     = "strata"
}

variable "vpc_id" {
  description = "The VPC of the cluster."
  type        = string
}

variable "subnet_ids" {
  description = "Three private subnets, one in each of three availability zones. Node i goes to subnet i % 3; a broker's rack is its subnet's zone."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) == 3 && length(distinct(var.subnet_ids)) == 3
    error_message = "Give exactly three distinct subnets, one per availability zone."
  }
}

variable "controller_count" {
  description = "Controllers (the Raft metadata quorum): 3 or 5."
  type        = number
  default     = 3

  validation {
    condition     = contains([3, 5], var.controller_count)
    error_message = "A quorum of 3 or 5 controllers."
  }
}

variable "broker_count" {
  description = "Brokers: at least 3 (replication factor 3 across the three zones)."
  type        = number
  default     = 3

  validation {
    condition     = var.broker_count >= 3
    error_message = "At least 3 brokers."
  }
}

variable "controller_instance_type" {
  description = "Instance type of the controllers: an NVMe instance-store type (i4i or i3en) for the Raft log's fsyncs."
  type        = string
  default     = "i4i.large"

  validation {
    condition     = can(regex("^(i4i|i3en)\\.[0-9a-z]+$", var.controller_instance_type))
    error_message = "An i4i or i3en instance type (local NVMe)."
  }
}

variable "broker_instance_type" {
  description = "Instance type of the brokers: an NVMe instance-store type (i4i or i3en); partition logs live on the local NVMe disks."
  type        = string
  default     = "i4i.2xlarge"

  validation {
    condition     = can(regex("^(i4i|i3en)\\.[0-9a-z]+$", var.broker_instance_type))
    error_message = "An i4i or i3en instance type (local NVMe)."
  }
}

variable "ami_id" {
  description = "AMI of the nodes (x86_64, systemd and cloud-init). Default: the latest Amazon Linux 2023."
  type        = string
  default     = null
}

variable "strata_binary_url" {
  description = "HTTPS URL of the strata binary (x86_64 Linux) the nodes install at first boot."
  type        = string

  validation {
    condition     = startswith(var.strata_binary_url, "https://")
    error_message = "An https:// URL."
  }
}

variable "strata_binary_sha256" {
  description = "SHA-256 of that binary; a node refuses to install anything else."
  type        = string

  validation {
    condition     = can(regex("^[0-9a-f]{64}$", var.strata_binary_sha256))
    error_message = "64 lowercase hex digits."
  }
}

variable "cold_url" {
  description = "[cold] url of the brokers: s3://BUCKET/PREFIX (modules/bucket output cold_urls)."
  type        = string

  validation {
    condition     = can(regex("^s3://[a-z0-9][a-z0-9.-]*/[a-zA-Z0-9._-]+(/[a-zA-Z0-9._-]+)*$", var.cold_url))
    error_message = "s3://BUCKET/PREFIX, with a prefix (the IAM policies are scoped to it)."
  }
}

variable "broker_instance_profile" {
  description = "Instance profile of the brokers (modules/iam)."
  type        = string
}

variable "controller_instance_profile" {
  description = "Instance profile of the controllers (modules/iam)."
  type        = string
}

variable "client_cidr_blocks" {
  description = "IPv4 networks of the Kafka clients; they reach the brokers' Kafka listener and nothing else."
  type        = list(string)
  default     = []
}

variable "client_security_group_ids" {
  description = "Security groups of Kafka clients; they reach the brokers' Kafka listener and nothing else."
  type        = list(string)
  default     = []
}

variable "monitoring_security_group_ids" {
  description = "Security groups of Prometheus scrapers; they reach the metrics and health port of every node."
  type        = list(string)
  default     = []
}

variable "kafka_port" {
  description = "[kafka] listen port of the brokers, the only port open to clients."
  type        = number
  default     = 9092
}

variable "controller_port" {
  description = "[controller] listen port: Raft between controllers and the controller API for brokers."
  type        = number
  default     = 9093
}

variable "grpc_port" {
  description = "[grpc] listen port of the brokers: replication between brokers."
  type        = number
  default     = 9095
}

variable "metrics_port" {
  description = "[metrics] listen port of every node: /metrics, /livez, /readyz."
  type        = number
  default     = 9096
}

variable "root_volume_gb" {
  description = "Size of the (encrypted gp3) root volume; data lives on the instance-store NVMe disks."
  type        = number
  default     = 30
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
