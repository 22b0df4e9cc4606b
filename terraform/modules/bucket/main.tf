# The cold-tier bucket of one or more Strata clusters (docs/tiered-storage.md):
#
# - no versioning: segment objects are immutable and uniquely named (base offset, leader epoch
#   and a random id), manifests are create-only puts of ever-increasing versions, and deletes
#   by retention, compaction and the orphan sweep must free the storage, not leave
#   noncurrent versions or delete markers behind;
# - one lifecycle rule per cluster prefix, whose only action aborts multipart uploads left
#   unfinished by a killed broker or compactor. There is deliberately no expiration or
#   transition: manifests (PREFIX/CLUSTER/TOPIC/PARTITION/manifest/*.json) sit beside the
#   segments they name, so no prefix filter could expire one without the other, and Strata's
#   own retention deletes a segment only after its manifest has dropped it;
# - SSE-KMS by default with a customer-managed key (bucket keys on, so the brokers' GETs do
#   not each call KMS); Strata sends no encryption headers, the bucket default applies;
# - public access blocked, ACLs disabled, and a bucket policy refusing plain HTTP and TLS
#   older than 1.2.

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

resource "aws_kms_key" "cold" {
  description             = "SSE-KMS key of the Strata cold-tier bucket ${var.bucket_name}"
  enable_key_rotation     = true
  deletion_window_in_days = var.kms_deletion_window_days
  # Administration and use are granted by IAM policies in this account (the iam module grants
  # the brokers, the compactor and the replay role exactly what S3 needs of the key).
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "AccountGrantsUseThroughIam"
      Effect    = "Allow"
      Principal = { AWS = "arn:${data.aws_partition.current.partition}:iam::${data.aws_caller_identity.current.account_id}:root" }
      Action    = "kms:*"
      Resource  = "*"
    }]
  })
  tags = var.tags
}

resource "aws_kms_alias" "cold" {
  name          = "alias/strata-cold-${replace(var.bucket_name, ".", "-")}"
  target_key_id = aws_kms_key.cold.key_id
}

resource "aws_s3_bucket" "cold" {
  #checkov:skip=CKV_AWS_21: versioning is deliberately off. Segment objects are immutable and uniquely named, manifests are create-only puts of increasing versions (the bucket itself is the manifest's history), and retention and compaction deletes must free storage rather than keep noncurrent versions of terabytes of segments.
  #checkov:skip=CKV_AWS_144: cross-region replication needs versioning, which is off (see CKV_AWS_21). A copy in a second region, if required, is configured outside this module.
  #checkov:skip=CKV2_AWS_62: nothing consumes event notifications of this bucket; the manifests are the only index of what it holds.
  bucket        = var.bucket_name
  force_destroy = false
  tags          = var.tags
}

resource "aws_s3_bucket_versioning" "cold" {
  bucket = aws_s3_bucket.cold.id
  versioning_configuration {
    # "Disabled": the bucket is created and stays unversioned (a DELETE removes the object;
    # "Suspended" would leave a delete marker for every deleted segment and manifest).
    status = "Disabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "cold" {
  bucket = aws_s3_bucket.cold.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.cold.arn
    }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_public_access_block" "cold" {
  bucket                  = aws_s3_bucket.cold.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "cold" {
  bucket = aws_s3_bucket.cold.id
  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "cold" {
  bucket = aws_s3_bucket.cold.id

  dynamic "rule" {
    for_each = var.cluster_prefixes
    content {
      id     = "abort-incomplete-multipart-uploads-${replace(rule.value, "/", "-")}"
      status = "Enabled"
      filter {
        prefix = "${rule.value}/"
      }
      # The only action: parts of an upload nobody will complete. Completed objects (segments
      # and manifests alike) are never expired by the bucket; Strata deletes them itself.
      abort_incomplete_multipart_upload {
        days_after_initiation = var.abort_incomplete_multipart_upload_days
      }
    }
  }
}

resource "aws_s3_bucket_policy" "cold" {
  bucket = aws_s3_bucket.cold.id
  policy = templatefile("${path.module}/templates/bucket-policy.json.tftpl", {
    partition = data.aws_partition.current.partition
    bucket    = aws_s3_bucket.cold.id
  })
  # The public access block first, so this policy is never evaluated as a public one.
  depends_on = [aws_s3_bucket_public_access_block.cold]
}

resource "aws_s3_bucket_logging" "cold" {
  bucket        = aws_s3_bucket.cold.id
  target_bucket = var.access_log_bucket
  target_prefix = "s3-access/${var.bucket_name}/"
}
