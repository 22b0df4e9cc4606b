# Least-privilege identities for one Strata cluster's cold tier. The S3 actions are exactly
# those Strata's object_store client issues (cold/src/store.rs and its callers):
#
#   s3:ListBucket           ListObjectsV2: manifest versions, the orphan sweep, the topic catalog
#   s3:GetObject            GetObject (whole and ranged reads of segments, indexes, manifests)
#   s3:PutObject            PutObject (segments, companions, topic.json, manifests with
#                           If-None-Match: *), multipart Create/UploadPart/Complete (segments
#                           over 32 MiB), CopyObject's destination (the compactor copies a
#                           producer snapshot; its source needs s3:GetObject)
#   s3:AbortMultipartUpload AbortMultipartUpload of a failed multipart upload
#   s3:DeleteObject         DeleteObject (retention, old manifest versions, orphans, compaction)
#
# each scoped to the cluster's prefix (objects: PREFIX/*; listing: s3:prefix PREFIX/...), plus
# the bucket's KMS key through S3 only. The policy documents are the templates in policies/;
# tests/test_terraform.py renders them and runs a broker, strata-replay and strata-compactor
# under them against an S3 server that enforces IAM.
#
# - broker:     read, write and delete (tiering, retention, orphan sweep);
# - compactor:  the same (rewrites segments, swaps manifests, deletes what it replaced);
# - replay:     list and read only (strata-replay ls / cat / export / replay), for the
#               audit team, assumed by the principals in replay_principal_arns;
# - controller: no S3 access at all (controllers never touch the bucket).

data "aws_partition" "current" {}

data "aws_region" "current" {}

locals {
  policy_vars = {
    partition   = data.aws_partition.current.partition
    region      = data.aws_region.current.name
    bucket      = var.bucket_name
    prefix      = var.prefix
    kms_key_arn = var.kms_key_arn
  }
  ec2_trust = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "Ec2InstancesOfTheCluster"
      Effect    = "Allow"
      Principal = { Service = "ec2.amazonaws.com" }
      Action    = "sts:AssumeRole"
    }]
  })
  ssm_core = "arn:${data.aws_partition.current.partition}:iam::aws:policy/AmazonSSMManagedInstanceCore"
}

# --- brokers -----------------------------------------------------------------------------

resource "aws_iam_role" "broker" {
  name               = "${var.cluster_name}-strata-broker"
  description        = "Strata brokers of ${var.cluster_name}: tiered storage under s3://${var.bucket_name}/${var.prefix}/"
  assume_role_policy = local.ec2_trust
  tags               = var.tags
}

resource "aws_iam_role_policy" "broker_cold_tier" {
  name   = "cold-tier"
  role   = aws_iam_role.broker.id
  policy = templatefile("${path.module}/policies/broker.json.tftpl", local.policy_vars)
}

resource "aws_iam_instance_profile" "broker" {
  name = "${var.cluster_name}-strata-broker"
  role = aws_iam_role.broker.name
  tags = var.tags
}

# --- controllers -------------------------------------------------------------------------

resource "aws_iam_role" "controller" {
  name               = "${var.cluster_name}-strata-controller"
  description        = "Strata controllers of ${var.cluster_name}: no object-store access"
  assume_role_policy = local.ec2_trust
  tags               = var.tags
}

resource "aws_iam_instance_profile" "controller" {
  name = "${var.cluster_name}-strata-controller"
  role = aws_iam_role.controller.name
  tags = var.tags
}

resource "aws_iam_role_policy_attachment" "ssm" {
  for_each   = var.enable_ssm ? { broker = aws_iam_role.broker.name, controller = aws_iam_role.controller.name, compactor = aws_iam_role.compactor.name } : {}
  role       = each.value
  policy_arn = local.ssm_core
}

# --- compactor ---------------------------------------------------------------------------

resource "aws_iam_role" "compactor" {
  name        = "${var.cluster_name}-strata-compactor"
  description = "strata-compactor of ${var.cluster_name}: rewrites segments and swaps manifests under s3://${var.bucket_name}/${var.prefix}/"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "TheCompactorsRuntime"
      Effect    = "Allow"
      Principal = { Service = var.compactor_service_principals }
      Action    = "sts:AssumeRole"
    }]
  })
  tags = var.tags
}

resource "aws_iam_role_policy" "compactor_cold_tier" {
  name   = "cold-tier"
  role   = aws_iam_role.compactor.id
  policy = templatefile("${path.module}/policies/compactor.json.tftpl", local.policy_vars)
}

resource "aws_iam_instance_profile" "compactor" {
  name = "${var.cluster_name}-strata-compactor"
  role = aws_iam_role.compactor.name
  tags = var.tags
}

# --- replay (audit team, read-only) ------------------------------------------------------

resource "aws_iam_role" "replay" {
  name                 = "${var.cluster_name}-strata-replay"
  description          = "strata-replay for the audit team: list and read s3://${var.bucket_name}/${var.prefix}/, nothing else"
  max_session_duration = 43200
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "TheAuditTeam"
      Effect    = "Allow"
      Principal = { AWS = var.replay_principal_arns }
      Action    = "sts:AssumeRole"
    }]
  })
  tags = var.tags
}

resource "aws_iam_role_policy" "replay_cold_tier" {
  name   = "cold-tier-read-only"
  role   = aws_iam_role.replay.id
  policy = templatefile("${path.module}/policies/replay.json.tftpl", local.policy_vars)
}
