# A 3 controller + 3 broker Strata cluster tiering to its own prefix of a new bucket: the
# controllers and the brokers spread over three availability zones (one of each per zone),
# brokers racked by zone, the cold tier at s3://BUCKET/PREFIX. See terraform/README.md.

module "bucket" {
  source            = "../../modules/bucket"
  bucket_name       = var.bucket_name
  cluster_prefixes  = [var.prefix]
  access_log_bucket = var.access_log_bucket
}

module "iam" {
  source                = "../../modules/iam"
  cluster_name          = var.cluster_name
  bucket_name           = module.bucket.bucket_name
  prefix                = var.prefix
  kms_key_arn           = module.bucket.kms_key_arn
  replay_principal_arns = var.replay_principal_arns
}

module "nodes" {
  source                        = "../../modules/nodes"
  cluster_name                  = var.cluster_name
  vpc_id                        = var.vpc_id
  subnet_ids                    = var.subnet_ids
  controller_count              = 3
  broker_count                  = 3
  controller_instance_type      = "i4i.large"
  broker_instance_type          = "i4i.2xlarge"
  strata_binary_url             = var.strata_binary_url
  strata_binary_sha256          = var.strata_binary_sha256
  cold_url                      = module.bucket.cold_urls[var.prefix]
  broker_instance_profile       = module.iam.broker_instance_profile
  controller_instance_profile   = module.iam.controller_instance_profile
  client_cidr_blocks            = var.client_cidr_blocks
  monitoring_security_group_ids = var.monitoring_security_group_ids
}
