-- AlterTable
ALTER TABLE "consumers" ADD COLUMN     "previous_secret" TEXT,
ADD COLUMN     "previous_secret_expires_at" TIMESTAMPTZ(3),
ADD COLUMN     "secret_rotated_at" TIMESTAMPTZ(3);
